"""`make run` loads the demo data once memcached is up (runstack --demo), so that the seeding's
writer stores the demo's answers instead of logging a WARNING about a memcached not started yet."""
import os
import re
import signal

import pytest

from plurksite.config import ROOT
from tests.support.stack import manage, output_until, stack_config, start_runstack


def _recipe(target):
    """(prerequisites, recipe lines) of a Makefile target."""
    text = open(os.path.join(ROOT, "Makefile")).read()
    match = re.search(rf"^{target}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, target
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_run_seeds_after_the_stack_is_up_not_before():
    prerequisites, recipe = _recipe("run")
    assert "demo" not in prerequisites and "migrate" in prerequisites
    assert recipe == ["$(PY) manage.py runstack --demo"]


@pytest.mark.slow
def test_the_first_run_seeds_into_the_running_memcached_without_a_warning(tmp_path):
    from pymemcache.client.base import Client

    config = stack_config(tmp_path, PLURK_GUNICORN_WORKERS="1")
    manage(config, "migrate", "--noinput", "-v", "0")
    proc = start_runstack(config, "--demo", start_new_session=True)
    try:
        text = output_until(proc, "Press Ctrl-C", 120)
        assert "The stack is up." in text, text
        assert "demo logins: alice, bob, carol, dave" in text
        assert "WARNING" not in text and "failed" not in text, text
        # alice's answers are in memcached before anyone logged in or polled: written by the seeding
        code = ("from fastpoll.keys import answer_key; from fastpoll.models import UserState; "
                "s = UserState.objects.get(user__username='alice'); print(answer_key('getMessages', s.user_id, s.epoch))")
        key = manage(config, "shell", "-c", code).stdout.strip().splitlines()[-1]
        host, port = config.memcached[0]
        client = Client((host, port))
        try:
            assert client.get(key) is not None, key
        finally:
            client.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
    assert "WARNING" not in rest, rest
