from fastpoll import conf, keys, publish, repair, resources
from fastpoll.cache import CacheUnavailable, get_cache
from fastpoll.management.base import StoreCommand
from fastpoll.models import UserState


class Command(StoreCommand):
    help = ("Compare every active user's cached poll answers, and every per-object answer memcached "
            "holds (listed with lru_crawler metadump), with the database and print the "
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
        self.differences = self.checked = 0
        for start in range(0, len(states), size):
            chunk = dict(states[start:start + size])
            self._check({resource: {keys.answer_key(resource.name, uid, epoch): uid for uid, epoch in chunk.items()}
                         for resource in resources.all_resources(per="user")}, fix)
        objects = self._cached_objects()
        for resource, ids in objects.items():
            for start in range(0, len(ids), size):
                self._check({resource: {keys.object_key(resource.name, ident): ident
                                        for ident in ids[start:start + size]}}, fix)
        differences = self.differences
        for node in sorted(self.unreachable):
            self.stderr.write(f"memcached {node} did not answer; its entries were not checked")
        summary = (f"{len(states)} user(s), {sum(map(len, objects.values()))} cached object answer(s), "
                   f"{self.checked} cached answer(s), {differences} difference(s)")
        if fix and differences:
            summary += " (fixed)"
        self.stdout.write(summary)
        if differences:
            raise SystemExit(1)
        if self.unreachable:
            raise SystemExit(2)      # nothing wrong found, but the check is incomplete

    def _check(self, key_of_by_resource, fix):
        """Compare, then compare again what differed (a change may have committed between our
        two reads) before calling it a difference; with ``fix``, rewrite those."""
        wrong = {}
        for resource, key_of in key_of_by_resource.items():
            found, suspects = self._compare(resource, key_of)
            self.checked += found
            if suspects:
                _, confirmed = self._compare(resource, {k: i for k, i in key_of.items() if i in suspects})
                for ident, (key, value, expected) in confirmed.items():
                    self.differences += 1
                    shown = None if expected is None else expected[:200]
                    self.stdout.write(f"{key}: cached {value[:200]!r}, database {shown!r}")
                    wrong.setdefault(resource.name, set()).add(ident)
        if fix and wrong:
            failed = publish.write_answers(wrong)
            if failed:
                self.stdout.write(f"could not rewrite {len(failed)} key(s); see repaircache")

    def _cached_objects(self):
        """{per-object resource: [object id, ...]} of the answers memcached holds."""
        by_name = {resource.name: resource for resource in resources.all_resources(per="object")}
        found = {}
        if not by_name:
            return found
        for node in self.cache.nodes:
            try:
                names = self.cache.keys_on(node)
            except CacheUnavailable as exc:
                self.stderr.write(str(exc))
                self.unreachable.add(node)
                continue
            for name in names:
                key = keys.parse_key(name)
                if key is not None and key.kind == "object" and key.resource in by_name:
                    found.setdefault(by_name[key.resource], []).append(keys.object_id(key.id))
        return found

    def _compare(self, resource, key_of):
        """(number of cached entries, {id: (key, cached, expected)} for those that differ);
        ``key_of`` is {key: user or object id}."""
        truth = resource.answers(publish.sorted_ids(set(key_of.values())))
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
