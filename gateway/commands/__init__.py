"""The `parley` subcommands, one module per area; `gateway.cli` parses and dispatches."""
