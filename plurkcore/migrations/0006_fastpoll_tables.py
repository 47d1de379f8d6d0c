"""fastpoll takes the generic tables over: each user's epoch moves to fastpoll's poll state, the
outbox and the cache's debts to fastpoll's own tables (the rows copied; an outbox row's change
in fastpoll's form, Plurk's follow graph as its "followers" audience); what is left of
plurkcore's user state is the read cursor."""
import json

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _change(text):
    old = json.loads(text)
    return json.dumps({"resources": None, "users": sorted(old["users"]), "objects": [],
                       "audiences": sorted(["followers", a] for a in old["followers_of"]),
                       "dead_keys": sorted(old["dead_keys"])}, separators=(",", ":"))


def to_fastpoll(apps, schema_editor):
    alias = schema_editor.connection.alias
    Old, New = apps.get_model("plurkcore", "UserState"), apps.get_model("fastpoll", "UserState")
    rows = list(Old.objects.using(alias).values_list("user_id", "epoch"))
    New.objects.using(alias).bulk_create([New(user_id=u, epoch=e) for u, e in rows], batch_size=1000,
                                         ignore_conflicts=True)
    OldPending, NewPending = apps.get_model("plurkcore", "PendingChange"), apps.get_model("fastpoll", "PendingChange")
    NewPending.objects.using(alias).bulk_create(
        [NewPending(change=_change(c), created=t) for c, t in OldPending.objects.using(alias).values_list("change", "created")])
    for name, fields in (("StaleKey", ("key", "generation", "since")), ("SuspectServer", ("server", "generation", "since"))):
        OldModel, NewModel = apps.get_model("plurkcore", name), apps.get_model("fastpoll", name)
        NewModel.objects.using(alias).bulk_create(
            [NewModel(**dict(zip(fields, row))) for row in OldModel.objects.using(alias).values_list(*fields)],
            ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("fastpoll", "0001_initial"),
        ("plurkcore", "0005_unread_counts_by_index"),
    ]

    operations = [
        migrations.RunPython(to_fastpoll, migrations.RunPython.noop, elidable=True),
        migrations.DeleteModel(name="PendingChange"),
        migrations.DeleteModel(name="StaleKey"),
        migrations.DeleteModel(name="SuspectServer"),
        migrations.RemoveField(model_name="userstate", name="epoch"),
        migrations.RenameModel(old_name="UserState", new_name="ReadCursor"),
        migrations.AlterField(
            model_name="readcursor", name="user",
            field=models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                                       related_name="plurk_cursor", serialize=False, to=settings.AUTH_USER_MODEL)),
        migrations.AlterModelOptions(name="readcursor", options={"verbose_name": "read cursor"}),
    ]
