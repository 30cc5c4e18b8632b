"""A client that hangs up mid-stream: the SDK reads 2 chunks of a slow
stream and closes it. The gateway must leave no upstream stream open
(within its 5 s drain bound) and still settle the tenant's budget with
exactly the usage of that completion."""

import time

from levee_sdk import MODEL, client, env, settled_tokens, sim_faults, sim_llm, sim_usage, tenant_tokens, wait_for

SIM = env("SIM_URL")
TENANT = env("LEVEE_TENANT")
DELAY_MS = 100
# One context sentence of 12 words: the answer streams as ~16 frames, so
# with 100 ms between frames the whole stream takes ~1.5 s.
MESSAGES = [
    {"role": "system", "content": "Full-time employees get 25 days of paid time off per calendar year."},
    {"role": "user", "content": "How many days of paid time off do employees get?"},
]

sim_faults(SIM, {"stream_chunk_delay_ms": DELAY_MS, "target": "chat"})
try:
    assert sim_llm(SIM)["streams_open"] == 0, "a stream is open before the test"
    before = sim_usage(SIM)
    tokens_before = tenant_tokens(TENANT)
    started = time.monotonic()
    stream = client().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    it = iter(stream)
    first = [next(it), next(it)]
    stream.close()
    closed_after = time.monotonic() - started
    open_at_close = sim_llm(SIM)["streams_open"]
    after = sim_usage(SIM)
    print(
        f"read {len(first)} chunks ({[c.choices[0].delta.content for c in first]}) and closed "
        f"after {closed_after:.2f} s; upstream streams open then: {open_at_close}"
    )
    assert closed_after < 1.0, f"closing took {closed_after:.2f} s: the stream was not cut short"

    open_now, waited = wait_for("upstream streams_open", lambda: sim_llm(SIM)["streams_open"], 0)
    assert open_now == 0, f"{open_now} upstream stream(s) still open {waited:.1f} s after the client left"

    completions = after[0] - before[0]
    prompt = after[1] - before[1]
    completion = after[2] - before[2]
    print(f"simulator delta: completions={completions} prompt={prompt} completion={completion}")
    assert completions == 1, f"{completions} completions for one stream"
    delta = settled_tokens(TENANT, tokens_before, prompt + completion)
    assert delta == prompt + completion, (
        f"tenant {TENANT} was charged {delta} tokens after the disconnect; "
        f"the completion used {prompt}+{completion}={prompt + completion}"
    )
finally:
    sim_faults(SIM, None)
print("ok")
