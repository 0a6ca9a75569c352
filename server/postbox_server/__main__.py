from postbox_server.cli import main

main()
