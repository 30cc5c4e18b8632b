"""Fallback through the SDK: one model on two deployments (two simulator
processes, equal weight); a steady sequence of non-streamed calls with
max_retries=0, and the first simulator SIGKILLed part-way. No call may
fail; both deployments answer before the kill, only the second after."""

import os
import signal
import time

from levee_sdk import MESSAGES, MODEL, client, env, openai

SIM1_PID = int(env("SIM1_PID"))
FIRST = env("DEPLOYMENT_1")
SECOND = env("DEPLOYMENT_2")
CALLS = int(os.environ.get("CALLS", "60"))
RATE = float(os.environ.get("RATE", "20"))
KILL_AFTER_S = float(os.environ.get("KILL_AFTER_S", "1.0"))

c = client(max_retries=0)
answered = []  # (index, deployment, seconds)
errors = []  # (index, error)
kill_index = None
started = time.monotonic()
for i in range(CALLS):
    pause = started + i / RATE - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    if kill_index is None and time.monotonic() - started >= KILL_AFTER_S:
        os.kill(SIM1_PID, signal.SIGKILL)
        kill_index = i
        print(f"SIGKILLed the first simulator (pid {SIM1_PID}) before call {i}")
    t0 = time.monotonic()
    try:
        raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
        completion = raw.parse()
        assert completion.choices[0].message.content, f"call {i}: empty answer"
        answered.append((i, raw.headers.get("x-levee-deployment"), time.monotonic() - t0))
    except openai.APIError as e:
        errors.append((i, f"{type(e).__name__}: {e}"))
took = time.monotonic() - started

assert kill_index is not None, "the run ended before the kill"
before = [d for i, d, _ in answered if i < kill_index]
after = [d for i, d, _ in answered if i >= kill_index]
slowest_after = max((s for i, _, s in answered if i >= kill_index), default=0.0)
print(
    f"{CALLS} calls in {took:.2f} s ({CALLS / took:.1f}/s); errors {len(errors)}; "
    f"before the kill: {before.count(FIRST)} x {FIRST}, {before.count(SECOND)} x {SECOND}; "
    f"after: {after.count(FIRST)} x {FIRST}, {after.count(SECOND)} x {SECOND}, "
    f"slowest after the kill {slowest_after * 1000:.0f} ms"
)
assert not errors, f"{len(errors)} client-visible errors, first: {errors[:3]}"
assert set(before) == {FIRST, SECOND}, f"before the kill the deployments answering were {sorted(set(before), key=str)}"
assert after and set(after) == {SECOND}, f"after the kill the deployments answering were {sorted(set(after), key=str)}"
print("ok")
