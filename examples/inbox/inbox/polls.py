import fastpoll

from .models import Notification


@fastpoll.resource("inbox", watch={Notification: lambda n: [n.user_id]})
def inbox(user_ids):
    unread = {}
    for n in Notification.objects.filter(user_id__in=user_ids, read=False).order_by("-created"):
        unread.setdefault(n.user_id, []).append({"id": n.pk, "text": n.text})
    return {uid: fastpoll.dumps({"unread": len(unread[uid]), "latest": unread[uid][:20]})
            if uid in unread else b"" for uid in user_ids}
