"""The chaos campaign: random operations under random faults against the split
deployment, checked afterwards by a checker that reads the whole history
(chaos/checker.py). `make chaos`; docs/reliability.md."""
