"""Run SummaryService alone: `python -m services.summary` (TranscriptService at
TRANSCRIPT_SERVICE_ADDR)."""

from services.common.main import main
from services.summary.component import SummaryComponent

if __name__ == "__main__":
    main("summary", lambda: [SummaryComponent()])
