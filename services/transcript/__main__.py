"""Run TranscriptService alone: `python -m services.transcript`."""

from services.common.main import main
from services.transcript.component import TranscriptComponent

if __name__ == "__main__":
    main("transcript", lambda: [TranscriptComponent()])
