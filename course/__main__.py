"""python -m course: the course's command line (course/cli.py)."""
import sys

from course.cli import main

main(sys.argv[1:])
