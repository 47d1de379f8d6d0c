from fastpoll import conf, keys, publish, repair, resources
from fastpoll.cache import CacheUnavailable, get_cache
from fastpoll.management.base import StoreCommand
from fastpoll.models import UserState


class Command(StoreCommand):
    help = ("Compare every active user's cached poll answers with the database and print the "
            "differences (a missing entry is not one: it is a miss).  Exit status 1 when a "
            "difference existed, 2 when a server did not answer (its entries went unchecked).  "
            "--fix repairs the differences.")

    def add_arguments(self, parser):
        parser.add_argument("--fix", action="store_true", help="rewrite the differing keys")

    def handle(self, *args, fix=False, **options):
        self.cache = get_cache()
        self.unreachable = set()
        if fix:
            report = repair.repair()
            for node in report["flushed"]:
                self.stdout.write(f"flushed suspect server {node}")
        size = conf.get_config()["BATCH_SIZE"]
        states = list(UserState.objects.filter(user__is_active=True).order_by("user_id")
                      .values_list("user_id", "epoch"))
        differences = checked = 0
        for start in range(0, len(states), size):
            chunk = dict(states[start:start + size])
            wrong = {}
            for resource in resources.all_resources(per="user"):
                found, suspects = self._compare(resource, chunk)
                checked += found
                if suspects:
                    # A change may have committed between our two reads: look again before
                    # calling it a difference.
                    _, confirmed = self._compare(resource, {uid: chunk[uid] for uid in suspects})
                    for uid, (key, value, expected) in confirmed.items():
                        differences += 1
                        shown = None if expected is None else expected[:200]
                        self.stdout.write(f"{key}: cached {value[:200]!r}, database {shown!r}")
                        wrong.setdefault(resource.name, set()).add(uid)
            if fix and wrong:
                failed = publish.write_answers(wrong)
                if failed:
                    self.stdout.write(f"could not rewrite {len(failed)} key(s); see repaircache")
        for node in sorted(self.unreachable):
            self.stderr.write(f"memcached {node} did not answer; its entries were not checked")
        summary = f"{len(states)} user(s), {checked} cached answer(s), {differences} difference(s)"
        if fix and differences:
            summary += " (fixed)"
        self.stdout.write(summary)
        if differences:
            raise SystemExit(1)
        if self.unreachable:
            raise SystemExit(2)      # nothing wrong found, but the check is incomplete

    def _compare(self, resource, epochs):
        """(number of cached entries, {uid: (key, cached, expected)} for those that differ)."""
        key_of = {keys.answer_key(resource.name, uid, epoch): uid for uid, epoch in epochs.items()}
        truth = resource.compute(sorted(epochs))
        cached = {}
        for node, node_keys in self.cache.group(key_of).items():
            try:
                cached.update(self.cache.get_many(node, node_keys))
            except CacheUnavailable:
                self.unreachable.add(node)
        differ = {}
        for key, value in cached.items():
            expected = truth.get(key_of[key])
            if value != expected:
                differ[key_of[key]] = (key, value, expected)
        return len(cached), differ
