"""Cache keys: parse_key is the exact inverse of answer_key."""
import pytest

from fastpoll import keys


def test_parse_key_inverts_answer_key():
    key = keys.answer_key("getMessages", 42, 7)
    assert keys.parse_key(key) == ("getMessages", 42, 7)


@pytest.mark.parametrize("key", ["p1:getMessages:42", "p2:getMessages:42:7", "p1:get Messages:42:7",
                                 "p1:getMessages:+42:7", "p1:getMessages:42: 7", "p1:getMessages:042:7",
                                 "p1:getMessages:x:7", "p1::42:7", "p1:getMessages:42:7:1"])
def test_parse_key_refuses_what_answer_key_never_makes(key):
    assert keys.parse_key(key) is None


def test_user_keys_one_per_resource():
    assert keys.user_keys(3, 1, ["a", "b"]) == {"p1:a:3:1", "p1:b:3:1"}
