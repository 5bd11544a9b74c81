"""Run AgentService alone: `python -m services.agent`.

Needs TRANSCRIPT_SERVICE_ADDR, SUMMARY_SERVICE_ADDR and MEMORY_SERVICE_ADDR.
"""

from services.agent.component import AgentComponent
from services.common.main import main

if __name__ == "__main__":
    main("agent", lambda: [AgentComponent()])
