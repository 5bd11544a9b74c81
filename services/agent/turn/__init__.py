"""A turn: its checks, budget, lease keeper, prompt, reply and replay, and the runner."""
