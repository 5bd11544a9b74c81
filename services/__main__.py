"""Run the all-in-one server: `python -m services` (what `make run` starts)."""

from services.allinone import components
from services.common.main import main

if __name__ == "__main__":
    main("all-in-one", components, all_in_one=True)
