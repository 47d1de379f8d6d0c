"""The JSON API (docs/api.md).  Every view is wrapped by :func:`plurkcore.http.api_view`."""
from django.contrib.auth import authenticate, get_user_model
from django.contrib.auth.signals import user_logged_in
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.middleware.csrf import get_token

import fastpoll

from .answers import RESOURCES, THREAD, isoformat, response_json, unread_counts
from .http import ApiError, api_view, field, is_storable_text, json_response, no_content, read_json
from .models import MAX_CONTENT_LENGTH, Follow, Plurk, ReadCursor

USERNAME_MAX = 150
PASSWORD_MIN = 8
PASSWORD_MAX = 4096      # login refuses longer ones before hashing, so signup must too
PROFILE_PLURKS = 20


def _user_json(user):
    return {"id": user.pk, "username": user.username}


def plurk_json(plurk):
    return {"id": plurk.pk, "author": plurk.author.username, "content": plurk.content,
            "created": isoformat(plurk.created), "response_count": plurk.response_count}


def _plurks():
    # A correlated count, run for the rows a page returns.  Count("responses") joined and grouped
    # every plurk of the authors with all its responses before the LIMIT: a timeline of authors
    # with 100,000 answered plurks took 0.5 s on SQLite, 0.2 s on PostgreSQL.
    responses = (Plurk.entries.filter(parent=OuterRef("pk")).order_by().values("parent")
                 .annotate(n=Count("*")).values("n"))
    return Plurk.objects.select_related("author").annotate(response_count=Coalesce(Subquery(responses), 0))


def _content(data):
    content = field(data, "content").strip()
    if not 1 <= len(content) <= MAX_CONTENT_LENGTH:
        raise ApiError(400, f"'content' must be 1 to {MAX_CONTENT_LENGTH} characters")
    return content


def _username(value):
    """A username as Django stores it (NFKC, what create_user and the login form apply), so that
    checks, lookups and the stored name agree: 'ﬁsh' signs up, logs in and is found as 'fish'."""
    return get_user_model().normalize_username(value)


def _credentials(data):
    username = _username(field(data, "username"))
    password = field(data, "password")
    return username, password


def _logged_in(request, user, status):
    # Django's convention for a login: receivers run (contrib.auth's sets last_login)
    user_logged_in.send(sender=user.__class__, request=request, user=user)
    ReadCursor.objects.get_or_create(user=user)
    # write this user's answers now, so that the first poll after a login is a hit
    fastpoll.touch(RESOURCES, users=[user])
    response = json_response({}, status=status)
    token = fastpoll.issue_token(user, response, request)
    response.content = fastpoll.dumps({"token": token, "user": _user_json(user)})
    get_token(request)      # CsrfViewMiddleware sets the csrftoken cookie on the way out
    return response


@api_view(["POST"], auth=False, logs_in=True)
def signup(request):
    data = read_json(request)
    username, password = _credentials(data)
    if not 1 <= len(username) <= USERNAME_MAX:
        raise ApiError(400, f"'username' must be 1 to {USERNAME_MAX} characters")
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise ApiError(400, "'username' may contain only letters, digits and @/./+/-/_") from None
    if set(username) == {"."}:
        # a profile URL /u/. or /u/.. is resolved away by every browser before it is sent
        raise ApiError(400, "'username' cannot be only dots")
    if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
        raise ApiError(400, f"'password' must be {PASSWORD_MIN} to {PASSWORD_MAX} characters")
    User = get_user_model()
    try:
        validate_password(password, User(username=username))
    except ValidationError as exc:
        raise ApiError(400, " ".join(exc.messages)) from None
    if User.objects.filter(username=username).exists():
        raise ApiError(409, "username taken")
    try:
        with transaction.atomic():
            user = User.objects.create_user(username=username, password=password)
    except IntegrityError:
        raise ApiError(409, "username taken") from None
    return _logged_in(request, user, 201)


@api_view(["POST"], auth=False, logs_in=True)
def login(request):
    data = read_json(request)
    username, password = _credentials(data)
    if len(username) > USERNAME_MAX or len(password) > PASSWORD_MAX:
        raise ApiError(401, "bad credentials")
    user = authenticate(request, username=username, password=password)
    if user is None:
        raise ApiError(401, "bad credentials")
    return _logged_in(request, user, 200)


@api_view(["POST"])
def logout(request):
    response = no_content()
    fastpoll.revoke(request.plurk_user, response)
    return response


@api_view(["GET"])
def me(request):
    user = request.plurk_user
    following = list(Follow.objects.filter(follower=user).order_by("followee__username")
                     .values_list("followee__username", flat=True))
    followers = Follow.objects.filter(followee=user).count()
    return json_response({"id": user.pk, "username": user.username, "following": following,
                          "followers": followers})


def _get_user(username, active=True):
    """The user of that name (as typed: normalized here); 404 when there is none, or when
    ``active`` and the account is deactivated."""
    username = _username(username)
    if len(username) > USERNAME_MAX or not is_storable_text(username):
        raise ApiError(404, "no such user")
    users = get_user_model().objects.filter(username=username)
    user = (users.filter(is_active=True) if active else users).first()
    if user is None:
        raise ApiError(404, "no such user")
    return user


@api_view(["GET"])
def user_detail(request, username):
    user = _get_user(username)
    plurks = _plurks().filter(author=user).order_by("-id")[:PROFILE_PLURKS]
    return json_response({
        "id": user.pk,
        "username": user.username,
        "followers": Follow.objects.filter(followee=user).count(),
        "following": Follow.objects.filter(follower=user).count(),
        "is_following": Follow.objects.filter(follower=request.plurk_user, followee=user).exists(),
        "plurks": [plurk_json(p) for p in plurks],
    })


@api_view(["POST"])
def follow(request):
    data = read_json(request)
    target = _get_user(field(data, "username"))
    if target.pk == request.plurk_user.pk:
        raise ApiError(400, "you cannot follow yourself")
    try:
        with transaction.atomic():
            _, created = Follow.objects.get_or_create(follower=request.plurk_user, followee=target)
    except IntegrityError:
        created = False
    return json_response({"following": target.username}, status=201 if created else 200)


@api_view(["DELETE"])
def unfollow(request, username):
    # a deactivated account's follows still feed its followers' timelines: they must be removable
    target = _get_user(username, active=False)
    with transaction.atomic():
        for row in Follow.objects.filter(follower=request.plurk_user, followee=target):
            row.delete()
    return no_content()


@api_view(["POST"])
def plurks(request):
    data = read_json(request)
    content = _content(data)
    with transaction.atomic():
        plurk = Plurk.objects.create(author=request.plurk_user, content=content)
    plurk.response_count = 0
    return json_response(plurk_json(plurk), status=201)


def _plurk_or_404(plurk_id):
    plurk = _plurks().filter(pk=plurk_id).first() if plurk_id <= 2**63 - 1 else None
    if plurk is None:
        raise ApiError(404, "no such plurk")
    return plurk


@api_view(["GET"])
def plurk_detail(request, plurk_id):
    plurk = _plurk_or_404(plurk_id)
    body = plurk_json(plurk)
    body["responses"] = [response_json(r) for r in
                         Plurk.entries.filter(parent=plurk).select_related("author").order_by("id")]
    # the thread's live answer: fastpath serves it to this user with this capability
    body["poll"] = fastpoll.capability_url(request.plurk_user, THREAD, plurk.pk)
    return json_response(body)


@api_view(["POST"])
def responses(request, plurk_id):
    data = read_json(request)
    plurk = _plurk_or_404(plurk_id)
    content = _content(data)
    with transaction.atomic():
        response = Plurk.entries.create(author=request.plurk_user, parent=plurk, content=content)
    return json_response(response_json(response), status=201)


def _int_param(request, name, default, low, high):
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or not low <= int(raw) <= high:
        raise ApiError(400, f"'{name}' must be an integer from {low} to {high}")
    return int(raw)


@api_view(["GET"])
def timeline(request):
    limit = _int_param(request, "limit", 20, 1, 100)
    before = _int_param(request, "before", None, 1, 2**63 - 1)
    user = request.plurk_user
    authors = Follow.objects.filter(follower=user).values("followee_id")
    qs = _plurks().filter(Q(author_id__in=authors) | Q(author=user))
    if before is not None:
        qs = qs.filter(pk__lt=before)
    items = list(qs.order_by("-id")[:limit + 1])
    more = len(items) > limit
    items = items[:limit]
    return json_response({"items": [plurk_json(p) for p in items],
                          "next": items[-1].pk if more else None})


@api_view(["POST"])
def mark_read(request):
    data = read_json(request)
    upto = field(data, "upto", int)
    if not 0 <= upto <= 2**63 - 1:
        raise ApiError(400, "'upto' must be an id (a non-negative integer)")
    user = request.plurk_user
    with transaction.atomic():
        highest = Plurk.entries.aggregate(highest=Max("id"))["highest"] or 0
        upto = min(upto, highest)
        ReadCursor.objects.get_or_create(user=user)
        if ReadCursor.objects.filter(user=user, read_upto__lt=upto).update(read_upto=upto):
            fastpoll.touch(RESOURCES, users=[user])
    return json_response({"count": unread_counts([user.pk]).get(user.pk, 0)})
