"""The staff side of the gateway: sign-in and sessions, the admin JSON API and its OpenAPI."""
