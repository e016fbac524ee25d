"""The aiohttp gateway: app factory, routes, middlewares, health, metrics and the CLI."""
