"""The settings of a server under test."""

from __future__ import annotations

from services.common.settings import Settings


def server_settings(**overrides: str) -> Settings:
    """Settings for an in-process server on an ephemeral loopback port."""
    env = {
        "RUNIFOLD_LISTEN": "127.0.0.1:0",
        "RUNIFOLD_METRICS_LISTEN": "off",
        "RUNIFOLD_HEALTH_INTERVAL_S": "0.2",
        "RUNIFOLD_SHUTDOWN_GRACE_S": "2",
        "RUNIFOLD_PAGE_TOKEN_SECRET": "test-secret-0123456789",
        "RUNIFOLD_DB_POOL_MIN": "1",
        "RUNIFOLD_DB_POOL_MAX": "8",
        "RUNIFOLD_LOG_LEVEL": "WARNING",
    }
    env.update(overrides)
    return Settings.from_env(env)
