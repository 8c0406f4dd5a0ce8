"""`python -m gpt <command> ...`: the same as the `tinygpt` console command."""

from gpt.apps.main import main

main()
