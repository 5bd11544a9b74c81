"""Test doubles that speak real protocols over loopback (HTTP servers and the like)."""
