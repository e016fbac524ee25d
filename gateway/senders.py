"""The sender for each agent's channel, built from the channel's declaration in the registry."""

from __future__ import annotations

from channels.registry import BY_NAME
from core.delivery import Sender
from core.settings import Settings
from core.store.agents import Agents


class AgentSenders:
    """The sender for each agent's channel, with the agent's own account when it has one
    (its settings block), else the environment's. Senders are kept while their credentials
    stay the same, and rebuilt when staff change them. A channel the agent has no
    credentials for has no sender (None)."""

    def __init__(self, settings: Settings, agents: Agents) -> None:
        self._settings = settings
        self._agents = agents
        self._senders: dict[tuple[int, str], tuple[tuple[str, ...], Sender]] = {}

    async def sender_for(self, agent_id: int, channel: str) -> Sender | None:
        found = BY_NAME.get(channel)
        if found is None:
            return None
        agent = await self._agents.by_id(agent_id)
        spec = found.sender_spec(agent, self._settings)
        if spec is None:
            return None
        known = self._senders.get((agent_id, channel))
        if known is not None and known[0] == spec.fingerprint:
            return known[1]
        if known is not None:
            await known[1].close()
        sender: Sender = spec.build()
        self._senders[(agent_id, channel)] = (spec.fingerprint, sender)
        return sender

    async def close(self) -> None:
        senders, self._senders = list(self._senders.values()), {}
        for _, sender in senders:
            await sender.close()
