"""`runifold mcp`: a Model Context Protocol server over Runifold (the `mcp` extra:
`pip install 'runifold-client[mcp]'`).

MCP clients (desktop assistants, IDE agents, agent frameworks) reach a namespace's
memories and conversations through it, as tools and as `runifold://` resources, with
the caller's own credentials: see server.py for the identity rules and
docs/integrations.md for configuring a client.
"""

from runifold_client.mcp.run import serve
from runifold_client.mcp.server import build_server
from runifold_client.mcp.settings import McpSettings, SettingsError

__all__ = ["McpSettings", "SettingsError", "build_server", "serve"]
