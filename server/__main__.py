from server.cli import main

main()
