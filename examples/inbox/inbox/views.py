import fastpoll
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render


@login_required
def index(request):
    if request.method == "POST":                     # "mark all read": update() sends no signal
        with transaction.atomic():
            request.user.notifications.filter(read=False).update(read=True)
            fastpoll.touch("inbox", users=[request.user])
        return redirect("inbox")
    return render(request, "inbox/index.html",
                  {"notifications": request.user.notifications.order_by("-created")[:20],
                   "boards": request.user.boards.order_by("name")})


@login_required
def board(request, pk):
    board = get_object_or_404(request.user.boards, pk=pk)      # members only read the board
    if request.method == "POST":
        board.announcements.create(text=request.POST["text"][:500])
        return redirect("board", pk=pk)
    return render(request, "inbox/board.html",
                  {"board": board, "announcements": board.announcements.order_by("-created")[:20],
                   "poll_url": fastpoll.capability_url(request.user, "board", board)})
