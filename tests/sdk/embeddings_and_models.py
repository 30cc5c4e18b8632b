"""Embeddings and the model listing through the SDK: a non-empty vector per
input with usage, and `models.list()` naming exactly what the gateway
serves (the configured names, or in passthrough mode the upstream's list)."""

import os

from levee_sdk import client, env

EXPECTED = env("EXPECTED_MODELS").split(",")
EMBEDDING_MODEL = os.environ.get("EMBEDDING_MODEL")
c = client()

listed = [m.id for m in c.models.list()]
print(f"models.list(): {listed}")
assert sorted(listed) == sorted(EXPECTED), f"models.list() gave {listed}, want {EXPECTED}"

if EMBEDDING_MODEL:
    inputs = ["paid time off policy", "laptop replacement"]
    resp = c.embeddings.create(model=EMBEDDING_MODEL, input=inputs)
    dims = [len(d.embedding) for d in resp.data]
    print(f"embeddings: {len(resp.data)} vectors of {dims} dims, usage {resp.usage}")
    assert len(resp.data) == len(inputs), f"{len(resp.data)} embeddings for {len(inputs)} inputs"
    assert all(n > 0 for n in dims), f"an empty vector: {dims}"
    assert [d.index for d in resp.data] == [0, 1], f"indices {[d.index for d in resp.data]}"
    assert any(x != 0.0 for x in resp.data[0].embedding), "an all-zero vector"
    assert resp.usage is not None and resp.usage.prompt_tokens > 0, f"usage {resp.usage}"
    assert resp.usage.total_tokens >= resp.usage.prompt_tokens, f"usage {resp.usage}"
print("ok")
