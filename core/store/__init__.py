"""PostgreSQL: the pool, migrations and the repositories that hold all of Parley's SQL."""

from core.store.agents import Agent, Agents
from core.store.database import Database, open_database
from core.store.migrate import migrate

__all__ = ["Agent", "Agents", "Database", "migrate", "open_database"]
