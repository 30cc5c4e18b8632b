"""An upstream that dies mid-stream (3 frames, then the connection is cut):
iterating the SDK's stream raises openai.APIError carrying the gateway's
SSE error event, not a bare connection error."""

from levee_sdk import MESSAGES, MODEL, client, env, openai, sim_faults

SIM = env("SIM_URL")
FAIL_AFTER = 3

sim_faults(SIM, {"stream_fail_after": FAIL_AFTER, "target": "chat"})
try:
    stream = client(max_retries=0).chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    received = []
    try:
        for chunk in stream:
            received.append(chunk)
    except openai.APIError as e:
        err = e
    else:
        raise AssertionError(f"the broken stream ended normally after {len(received)} chunks")
finally:
    sim_faults(SIM, None)

print(f"{len(received)} chunks, then {type(err).__name__}: {err}; body {err.body!r}")
assert not isinstance(err, openai.APIConnectionError), (
    f"the stream ended in a bare connection error ({type(err).__name__}), not the gateway's SSE error event"
)
assert isinstance(err.body, dict) and err.body.get("message"), f"the error event has no message: {err.body!r}"
assert len(received) <= FAIL_AFTER, f"{len(received)} chunks from an upstream that sent {FAIL_AFTER} frames"
print("ok")
