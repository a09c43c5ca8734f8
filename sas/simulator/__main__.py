from sas.simulator.cli import main

main()
