"""Run MemoryService alone: `python -m services.memory`.

`python -m services.memory reindex` rebuilds the vector index from
PostgreSQL (after a model change, a lost index, or to reconcile), with a
progress bar. With the Edge index, stop the server first: one process opens
the shard at a time.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace

from services.common import logs
from services.common.main import configuration_error, main
from services.common.settings import Settings, SettingsError
from services.memory.component import MemoryComponent
from services.memory.config import MemoryConfig


async def _reindex(settings: Settings, config: MemoryConfig) -> int:
    from tqdm import tqdm

    from services.common import migrations
    from services.common.postgres.embedded import start_embedded_postgres
    from services.memory.component import MIGRATIONS, make_embedder, make_index
    from services.memory.index.protocol import IndexUnavailable
    from services.memory.outbox.indexer import reindex
    from services.memory.store import PostgresMemoryStore

    url = settings.database_url or start_embedded_postgres(settings.data_dir / "postgres")
    # Reindex never migrates: it reads the schema the server made.
    db = await migrations.open_database(
        url, replace(settings, migrate="check"), "memory", MIGRATIONS
    )
    embedder = make_embedder(config)
    index = make_index(
        config,
        model=embedder.model,
        dimension=embedder.dimension,
        edge_dir=settings.data_dir / "memory-index",
        database_url=url,
    )
    try:
        store = PostgresMemoryStore(db)
        await embedder.start()
        try:
            await index.start()
        except IndexUnavailable as exc:
            print(
                f"reindex: cannot open the {index.name} index ({exc.detail}); with the Edge "
                "index, stop the server first (one process opens a shard at a time)",
                file=sys.stderr,
            )
            return 1
        total = await store.memory_count()
        with tqdm(total=total, unit="memory", desc=f"reindex ({index.name})") as bar:
            indexed, orphans = await reindex(store, index, embedder, progress=bar.update)
        print(
            f"reindex: {indexed} memories indexed with {embedder.model} "
            f"({embedder.dimension} dimensions), {orphans} orphaned points removed",
            file=sys.stderr,
        )
        return 0
    finally:
        await index.close()
        await embedder.close()
        await db.close()


def _main() -> None:
    if sys.argv[1:2] == ["reindex"]:
        try:
            settings = Settings.from_env()
            config = MemoryConfig.from_env()
        except SettingsError as exc:
            configuration_error(exc)
        logs.configure("memory-reindex", settings.log_level, settings.log_format)
        raise SystemExit(asyncio.run(_reindex(settings, config)))
    if sys.argv[1:]:
        print("usage: python -m services.memory [reindex]", file=sys.stderr)
        raise SystemExit(2)
    main("memory", lambda: [MemoryComponent()])


if __name__ == "__main__":
    _main()
