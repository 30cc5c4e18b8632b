"""429 through the SDK: a key whose tier allows 2 requests per window gets
openai.RateLimitError on the third with max_retries=0 (Retry-After and
x-ratelimit-* headers, code rate_limit_exceeded); with max_retries=2 the
SDK waits out the announced Retry-After and the call then succeeds."""

import time

from levee_sdk import MODEL, client, env, openai

KEY = env("TIGHT_KEY")
LIMIT = int(env("TIGHT_LIMIT"))
MESSAGES = [{"role": "user", "content": "Hello"}]
c = client(KEY, max_retries=0)

for i in range(LIMIT):
    c.chat.completions.create(model=MODEL, messages=MESSAGES)

try:
    c.chat.completions.create(model=MODEL, messages=MESSAGES)
except openai.RateLimitError as e:
    err = e
else:
    raise AssertionError(f"call {LIMIT + 1} within the window was not refused")

headers = err.response.headers
print(f"429 headers: { {k: v for k, v in headers.items() if 'rate' in k or 'retry' in k} }")
print(f"429 body: {err.body}")
assert err.status_code == 429, f"status {err.status_code}"
assert headers.get("retry-after"), "no retry-after header on the 429"
assert headers.get("x-ratelimit-limit") == str(LIMIT), f"x-ratelimit-limit {headers.get('x-ratelimit-limit')!r}"
assert headers.get("x-ratelimit-remaining") == "0", f"x-ratelimit-remaining {headers.get('x-ratelimit-remaining')!r}"
assert isinstance(err.body, dict), f"error body is not OpenAI's error object: {err.body!r}"
assert err.code == "rate_limit_exceeded", f"error.code {err.code!r}"
assert err.body.get("type") == "requests", f"error.type {err.body.get('type')!r}"
retry_after = float(headers["retry-after"])
assert 0 < retry_after <= 2, f"Retry-After {retry_after} s for a 2 s window"

patient = client(KEY, max_retries=2)
started = time.monotonic()
resp = patient.chat.completions.create(model=MODEL, messages=MESSAGES)
elapsed = time.monotonic() - started
print(f"with max_retries=2 the call succeeded after {elapsed:.3f} s (Retry-After was {retry_after} s)")
assert resp.choices[0].message.content, "empty answer after the retry"
assert elapsed >= retry_after - 0.1, (
    f"the SDK retried after {elapsed:.3f} s, before the announced Retry-After of {retry_after} s"
)
print("ok")
