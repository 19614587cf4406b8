"""The sections of the configuration file, each a frozen model (toolsearch/config.py loads the file):
what every section is made of (`settings`), the router's, the indexer's and the backends' own, the
state address, and the server lists other clients keep (`backends_from`)."""
