from draftfit.cli import main

main()
