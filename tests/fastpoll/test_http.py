"""fastpoll.dumps: the contract's one JSON encoding (docs/contract.md section 5), which also takes
what a model's fields hold (found adopting fastpoll: a UUID-user project putting
``task.assignee_id`` in an answer got TypeError in compute, and its polls answered 500).

What is not one JSON text is refused in one line (a hostile review: a lazy translation string was
written in the writer's language, NaN as ``NaN``, a lone surrogate a UnicodeEncodeError)."""
import datetime
import decimal
import json
import uuid

import pytest
from django.utils import translation
from django.utils.translation import gettext_lazy

import fastpoll


def _before(obj):
    """The encoding as it was: every type that encoded then must give the same bytes now."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("obj", [
    {"count": 3, "items": [{"id": 1, "content": "héllo \u2028 \"q\" \\ \n\t", "emoji": "\U0001f600"}]},
    [None, True, False, 0, -1, 2 ** 70, 1.5, 1e100, -0.0, 1e-320, "", [], {}],
    {"ünï": ["\x00\x1f", "</script>", "a\u00a0b"], "1": {"2": [3]}},
    ("a", "tuple"),
    "text",
    12,
])
def test_what_encoded_before_gives_the_same_bytes(obj):
    assert fastpoll.dumps(obj) == _before(obj)


def test_uuids_datetimes_and_decimals_are_encoded_as_django_encodes_them():
    uid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = datetime.datetime(2026, 11, 27, 12, 30, 45, 123456, tzinfo=datetime.timezone.utc)
    assert fastpoll.dumps({"assignee": uid, "at": when, "day": when.date(), "time": datetime.time(9, 5),
                           "price": decimal.Decimal("1.10")}) == (
        b'{"assignee":"12345678-1234-5678-1234-567812345678","at":"2026-11-27T12:30:45.123Z",'
        b'"day":"2026-11-27","time":"09:05:00","price":"1.10"}')


def test_what_json_cannot_say_is_still_a_type_error():
    with pytest.raises(TypeError):
        fastpoll.dumps({"x": object()})


@pytest.mark.parametrize("obj", [float("nan"), [1, float("inf")], {"x": -float("inf")}])
def test_nan_and_infinity_are_not_json(obj):
    with pytest.raises(ValueError, match=r"^fastpoll.dumps: NaN and Infinity are not JSON \(docs/contract.md, "
                                         r"section 5\); store None or a string for them$"):
        fastpoll.dumps(obj)


@pytest.mark.parametrize("obj", [{"status": gettext_lazy("Password")}, [gettext_lazy("Password")]])
def test_a_lazy_translation_string_is_refused_whatever_the_active_language(obj):
    for language in ("en", "fr"):
        with translation.override(language):
            with pytest.raises(TypeError, match=r"^fastpoll.dumps: a lazy translation string has no one language "
                                                r"in a cached answer .* translate it in compute for the reader "
                                                r"\(with translation.override\(<language>\): str\(text\)\) or "
                                                r"store plain str$"):
                fastpoll.dumps(obj)
    assert fastpoll.dumps([str(gettext_lazy("Password"))]) == b'["Password"]'


@pytest.mark.parametrize("obj, bad", [({"text": "ok \ud800 after"}, "'\\ud800'"), ({"\udcff": 1}, "'\\udcff'")])
def test_a_lone_surrogate_is_one_clear_value_error(obj, bad):
    with pytest.raises(ValueError) as info:
        fastpoll.dumps(obj)
    assert type(info.value) is ValueError and str(info.value).startswith(
        f"fastpoll.dumps: a lone surrogate {bad} in the answer"), info.value
    assert "is not UTF-8" in str(info.value)
