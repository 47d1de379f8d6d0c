"""System checks for settings.PLURKCORE."""
import pytest
from django.core import checks

from plurkcore.checks import check_settings


@pytest.mark.parametrize("overrides,expected", [
    ({}, set()),
    ({"NOPE": 1}, {"plurkcore.W001"}),
    ({"MEMCACHED_SERVERS": []}, {"plurkcore.E002"}),
    ({"MEMCACHED_SERVERS": ["nohost"]}, {"plurkcore.E002"}),
    ({"MEMCACHED_SERVERS": ["a:1", "a:1"]}, {"plurkcore.E002"}),
    ({"MEMCACHED_TIMEOUT": 0}, {"plurkcore.E003"}),
    ({"MEMCACHED_TIMEOUT": 5}, {"plurkcore.W002"}),
    ({"TOKEN_TTL": "1d"}, {"plurkcore.E004"}),
    ({"CACHE_TTL": 40 * 24 * 3600}, {"plurkcore.E004"}),
    ({"SECRET_FILE": None}, {"plurkcore.E005"}),
    ({"SECRET_FILE": "/nonexistent/secret"}, {"plurkcore.E006"}),
    ({"COOKIE_NAME": "tok"}, {"plurkcore.W003"}),
])
def test_checks(settings, overrides, expected):
    settings.PLURKCORE = {**settings.PLURKCORE, "MEMCACHED_SERVERS": ["127.0.0.1:11211"], **overrides}
    assert {e.id for e in check_settings()} == expected


def test_not_a_dict(settings):
    settings.PLURKCORE = ["x"]
    assert [e.id for e in check_settings()] == ["plurkcore.E001"]


def test_registered(settings):
    settings.PLURKCORE = dict(settings.PLURKCORE, MEMCACHED_TIMEOUT=-1)
    assert "plurkcore.E003" in {e.id for e in checks.run_checks()}
