import fastpoll
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render


def page(request, template, context):
    """A page whose script (inbox/inbox.js) streams from the edge when there is one: the
    script learns where from ``edge_url``, and the Content-Security-Policy lets it connect there."""
    edge = fastpoll.edge_url(request)                # "" without an edge: the site only
    response = render(request, template, dict(context, edge_url=edge))
    response["Content-Security-Policy"] = f"default-src 'self'; connect-src 'self' {edge}".strip()
    return response


@login_required
def index(request):
    if request.method == "POST":                     # "mark all read": update() sends no signal
        with transaction.atomic():
            request.user.notifications.filter(read=False).update(read=True)
            fastpoll.touch("inbox", users=[request.user])
        return redirect("inbox")
    return page(request, "inbox/index.html",
                {"notifications": request.user.notifications.order_by("-created")[:20],
                 "boards": request.user.boards.order_by("name")})


@login_required
def board(request, pk):
    board = get_object_or_404(request.user.boards, pk=pk)      # members only read the board
    if request.method == "POST":
        board.announcements.create(text=request.POST["text"][:500])
        return redirect("board", pk=pk)
    return page(request, "inbox/board.html",
                {"board": board, "announcements": board.announcements.order_by("-created")[:20],
                 "poll_url": fastpoll.capability_url(request.user, "board", board)})
