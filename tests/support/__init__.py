"""Helpers the tests share: real service processes and URL handling."""
