import fastpoll
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import redirect, render


@login_required
def index(request):
    if request.method == "POST":                     # "mark all read": update() sends no signal
        with transaction.atomic():
            request.user.notifications.filter(read=False).update(read=True)
            fastpoll.touch("inbox", users=[request.user])
        return redirect("inbox")
    return render(request, "inbox/index.html",
                  {"notifications": request.user.notifications.order_by("-created")[:20]})
