from onceq._cli import main

main()
