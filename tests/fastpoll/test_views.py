"""The poll view's refusals are JSON and say what is wrong with the path or the capability."""
import pytest

from fastpoll import capability

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("path, error", [
    ("/Poll/getUnreadCount/12", "'getUnreadCount' is a per-user resource: its path has no object"),
    ("/Poll/getThread", "'getThread' is a per-object resource: its path ends in the object's id"),
    ("/Poll/getNothing", "unknown poll resource 'getNothing'"),
    ("/Poll/", "no poll resource at this path"),
    ("/Poll/getUnreadCount/", "no poll resource at this path"),
    ("/Poll/%ff%fe", "no poll resource at this path"),
    ("/Poll/" + "x" * 40, "no poll resource at this path"),
])
def test_a_path_that_names_no_resource_is_a_json_404(signup, client, path, error):
    a = signup("a")
    resp = client.get(path, HTTP_AUTHORIZATION=f"Bearer {a.token}")
    assert resp.status_code == 404 and resp["Content-Type"].startswith("application/json")
    assert resp.json()["error"].startswith(error), resp.json()


def test_another_users_capability_is_refused_as_such(signup, client):
    a, b = signup("a"), signup("b")
    plurk = a.call("POST", "/api/plurks", {"content": "x"}).json()["id"]
    url = a.call("GET", f"/api/plurks/{plurk}").json()["poll"]
    resp = client.get(url, HTTP_AUTHORIZATION=f"Bearer {b.token}")
    assert resp.status_code == 403 and resp.json() == {"error": "capability is for another user"}
    other = capability.url(a.user["id"], "getThread", plurk + 1000)
    resp = client.get(other.replace(f"/{plurk + 1000}?", f"/{plurk}?"), HTTP_AUTHORIZATION=f"Bearer {a.token}")
    assert resp.status_code == 403 and resp.json() == {"error": "capability is for another object"}
