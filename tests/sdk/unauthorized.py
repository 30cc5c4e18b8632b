"""401 through the SDK: an unknown key raises openai.AuthenticationError
with OpenAI's code invalid_api_key."""

from levee_sdk import MESSAGES, MODEL, client, openai

c = client("sk-not-a-key-levee-knows", max_retries=0)
try:
    c.chat.completions.create(model=MODEL, messages=MESSAGES)
except openai.AuthenticationError as e:
    print(f"401 body: {e.body}")
    assert e.status_code == 401, f"status {e.status_code}"
    assert e.code == "invalid_api_key", f"error.code {e.code!r}"
else:
    raise AssertionError("an unknown key was served")

try:
    c.models.list()
except openai.AuthenticationError as e:
    print(f"models.list() with the unknown key: {e.status_code} {e.code}")
else:
    raise AssertionError("an unknown key listed the models")
print("ok")
