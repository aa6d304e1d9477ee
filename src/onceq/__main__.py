from onceq.cli import main

main()
