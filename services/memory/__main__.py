"""Run MemoryService alone: `python -m services.memory`.

`python -m services.memory reindex` rebuilds the vector index from
PostgreSQL (after a model change, a lost index, or to reconcile), with a
progress bar. With the Edge index, stop the server first: one process opens
the shard at a time.
"""

from __future__ import annotations

import asyncio
import sys

from services.common import logs
from services.common.main import main
from services.common.settings import Settings, SettingsError
from services.memory.component import MemoryComponent


async def _reindex(settings: Settings) -> int:
    from tqdm import tqdm

    from services.common import migrations
    from services.common.db import Database, start_embedded_postgres
    from services.memory.component import MIGRATIONS, index_for
    from services.memory.config import MemoryConfig
    from services.memory.embeddings import make_embedder
    from services.memory.index import IndexUnavailable
    from services.memory.indexer import reindex
    from services.memory.store import PostgresMemoryStore

    try:
        config = MemoryConfig.from_env()
    except SettingsError as exc:
        print(f"runifold: configuration error: {exc}", file=sys.stderr)
        return 2
    url = settings.database_url or start_embedded_postgres(settings.data_dir / "postgres")
    db = Database(url, settings, name="memory")
    await db.open()
    embedder = make_embedder(config)
    index = index_for(config, settings, url, embedder)
    try:
        await migrations.check(db, "memory", MIGRATIONS)
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
        except SettingsError as exc:
            print(f"runifold: configuration error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        logs.configure("memory-reindex", settings.log_level, settings.log_format)
        raise SystemExit(asyncio.run(_reindex(settings)))
    if sys.argv[1:]:
        print("usage: python -m services.memory [reindex]", file=sys.stderr)
        raise SystemExit(2)
    main("memory", lambda: [MemoryComponent()])


if __name__ == "__main__":
    _main()
