from powerd.cli import main

main()
