"""Cache keys: parse_key is the exact inverse of the three makers."""
import uuid

import pytest

from fastpoll import keys


def test_parse_key_inverts_answer_key():
    assert keys.parse_key(keys.answer_key("getMessages", 42, 7)) == ("user", "getMessages", "42", 7)
    uid = uuid.UUID("3f2a9c1e-0000-4000-8000-00000000002a")
    key = keys.answer_key("inbox", uid, 0)
    assert key == "p1:inbox:3f2a9c1e-0000-4000-8000-00000000002a:0"
    assert keys.parse_key(key) == ("user", "inbox", str(uid), 0)


def test_object_and_marker_keys():
    assert keys.object_key("thread", 5) == "p1:thread:5:o"
    assert keys.parse_key("p1:thread:5:o") == ("object", "thread", "5", None)
    assert keys.marker_key(3, 1) == "p1:@:3:1"
    assert keys.parse_key("p1:@:3:1") == ("marker", None, "3", 1)


@pytest.mark.parametrize("key", ["p1:getMessages:42", "p2:getMessages:42:7", "p1:get Messages:42:7",
                                 "p1:getMessages:+42:7", "p1:getMessages:42: 7", "p1:getMessages:42:07",
                                 "p1:getMessages:x.y:7", "p1::42:7", "p1:getMessages:42:7:1",
                                 "p1:getMessages:42:O", "p1:@:42:o", "p1:getMessages:" + "a" * 65 + ":1"])
def test_parse_key_refuses_what_the_makers_never_make(key):
    assert keys.parse_key(key) is None


@pytest.mark.parametrize("bad", ["a b", "a:b", "a.b", "", "x" * 65, -1, True])
def test_ids_outside_the_grammar_are_refused(bad):
    with pytest.raises(ValueError):
        keys.answer_key("getMessages", bad, 0)


def test_user_keys_one_per_resource_and_the_marker():
    assert keys.user_keys(3, 1, ["a", "b"]) == {"p1:a:3:1", "p1:b:3:1", "p1:@:3:1"}


def test_the_prefix_is_a_setting(settings):
    settings.FASTPOLL = dict(settings.FASTPOLL, KEY_PREFIX="site2")
    assert keys.answer_key("getMessages", 1, 0) == "site2:getMessages:1:0"
    assert keys.parse_key("p1:getMessages:1:0") is None
