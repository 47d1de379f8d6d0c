import fastpoll

from .models import Announcement, Notification


@fastpoll.resource("inbox", watch={Notification: lambda n: [n.user_id]})
def inbox(user_ids):
    unread = {}
    for n in Notification.objects.filter(user_id__in=user_ids, read=False).order_by("-created"):
        unread.setdefault(n.user_id, []).append({"id": n.pk, "text": n.text})
    return {uid: fastpoll.dumps({"unread": len(unread[uid]), "latest": unread[uid][:20]})
            if uid in unread else b"" for uid in user_ids}


@fastpoll.resource("board", per="object", watch={Announcement: lambda a: [a.board_id]})
def board(board_ids):
    latest = {}
    for a in Announcement.objects.filter(board_id__in=board_ids).order_by("-created"):
        latest.setdefault(a.board_id, []).append({"id": a.pk, "text": a.text})
    return {bid: fastpoll.dumps({"count": len(latest[bid]), "latest": latest[bid][:20]})
            if bid in latest else b"" for bid in board_ids}
