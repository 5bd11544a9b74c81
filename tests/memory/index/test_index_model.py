"""The index's names: a collection per model, a point per memory and namespace."""

from __future__ import annotations

from services.memory.index.model import collection_name, point_id


def test_collections_and_points_are_per_model_and_namespace() -> None:
    assert collection_name("sentence-transformers/all-MiniLM-L6-v2", 384) == (
        "runifold_memory_sentence_transformers_all_minilm_l6_v2_384"
    )
    import uuid

    mid = uuid.uuid4()
    assert point_id("a", mid) != point_id("b", mid)
    assert point_id("a", mid) == point_id("a", mid)
