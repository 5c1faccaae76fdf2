"""Error mapping: every kind of dsecd's closed set becomes the exception class of its
name, carrying dsecd's message; connection failures and refusals of the TCP door."""
from __future__ import annotations

import json
import os
import unittest

from _env import IMAGE, REMOTE, RUN, client

import dsec
from dsec._errors import error_from_response

#: The closed set of daemon/errors.ts with the statuses it maps them to.
KINDS = {
    "InvalidArgument": 400, "Unauthenticated": 401, "PermissionDenied": 403, "NotFound": 404,
    "AlreadyExists": 409, "Conflict": 409, "FailedPrecondition": 412, "ResourceExhausted": 429,
    "Internal": 500, "Unimplemented": 501, "Unavailable": 503, "DeadlineExceeded": 504,
}


class Mapping(unittest.TestCase):
    def test_every_kind_has_its_class(self) -> None:
        self.assertEqual(set(dsec.ERROR_CLASSES), set(KINDS))
        for kind, status in KINDS.items():
            body = json.dumps({"error": {"code": kind, "message": f"m {kind}", "reason": "r"}}).encode()
            e = error_from_response(status, body)
            self.assertIs(type(e), getattr(dsec, kind))
            self.assertIsInstance(e, dsec.DsecError)
            self.assertEqual((e.code, e.message, e.status, e.reason), (kind, f"m {kind}", status, "r"))

    def test_a_body_without_a_code_maps_by_status(self) -> None:
        self.assertIsInstance(error_from_response(404, b"<html>gone</html>"), dsec.NotFound)
        self.assertIsInstance(error_from_response(502, b""), dsec.Internal)
        self.assertIn("gone", error_from_response(404, b"gone").message)


class Live(unittest.TestCase):
    def setUp(self) -> None:
        self.c = client()

    def tearDown(self) -> None:
        self.c.close()

    def test_not_found_carries_dsecds_message(self) -> None:
        with self.assertRaises(dsec.NotFound) as cm:
            self.c.sandboxes.get("0123456789abcdef")
        self.assertIn("0123456789abcdef", cm.exception.message)
        self.assertEqual(cm.exception.status, 404)

    def test_invalid_argument(self) -> None:
        with self.assertRaises(dsec.InvalidArgument):
            self.c.sandboxes.create(image=IMAGE, cpus=-1)
        with self.assertRaises(dsec.InvalidArgument):
            self.c.sandboxes.bulk("", "pause")

    def test_missing_image_and_bad_snapshot(self) -> None:
        with self.assertRaises(dsec.NotFound):
            self.c.sandboxes.create(image=f"no-such-image-{RUN}")
        with self.assertRaises(dsec.NotFound):
            self.c.snapshots.fork(f"no-such-{RUN}", 2)

    def test_unreachable_socket_is_unavailable(self) -> None:
        c = dsec.Client(socket="/nonexistent/dsecd.sock")
        with self.assertRaises(dsec.Unavailable) as cm:
            c.version()
        self.assertIn("/nonexistent/dsecd.sock", cm.exception.message)


@unittest.skipUnless(REMOTE, "the TCP door's refusals need DSEC_HOST")
class Door(unittest.TestCase):
    def test_no_or_a_wrong_token_is_unauthenticated(self) -> None:
        host, ca = os.environ["DSEC_HOST"], os.environ["DSEC_CA"]
        for tok in (None, "e2b_" + "0" * 40):
            with dsec.Client(host=host, ca=ca, token=tok) as c, self.assertRaises(dsec.Unauthenticated):
                c.sandboxes.list()

    def test_an_untrusted_ca_is_unavailable_naming_tls(self) -> None:
        with dsec.Client(host=os.environ["DSEC_HOST"], token=os.environ["DSEC_TOKEN"], ca=None) as c, self.assertRaises(dsec.Unavailable) as cm:
            c.version()
        self.assertIn("TLS", cm.exception.message)

    def test_another_tenants_token_is_refused(self) -> None:
        # A `user` of tenant other: this tenant's sandbox is NotFound to it (by id, in lists,
        # for exec), exactly as a missing one; it may not act as an admin (token
        # administration); and a `reader` may not create.
        host, ca = os.environ["DSEC_HOST"], os.environ["DSEC_CA"]
        other = dsec.Client(host=host, ca=ca, token=os.environ["DSEC_TEST_OTHER_TOKEN"])
        self.addCleanup(other.close)
        self.assertEqual(other.whoami()["tenant"], "other")
        mine = client()
        self.addCleanup(mine.close)
        sb = mine.sandboxes.create(image=IMAGE, labels={"run": RUN, "case": "tenancy"})
        self.addCleanup(sb.destroy)
        with self.assertRaises(dsec.NotFound):
            other.sandboxes.get(sb.id)
        self.assertNotIn(sb.id, [x.id for x in other.sandboxes.list()])
        with self.assertRaises(dsec.NotFound):
            other.sandboxes.get(sb.id[:-1] + ("0" if sb.id[-1] != "0" else "1"))
        theirs = other.sandboxes.create(image=IMAGE, labels={"run": RUN, "case": "tenancy"})
        self.addCleanup(theirs.destroy)
        self.assertEqual(theirs.exec(["echo", "ok"]).stdout, b"ok\n")
        # The admin token sees every tenant's sandboxes.
        self.assertIn(theirs.id, [x.id for x in mine.sandboxes.list(selector=f"run={RUN}")])
        with self.assertRaises(dsec.PermissionDenied) as cm:
            other.tokens.create(tenant="system", role="admin")
        self.assertTrue(cm.exception.message)
        with self.assertRaises(dsec.PermissionDenied):
            other.tokens.list()
        reader = dsec.Client(host=host, ca=ca, token=os.environ["DSEC_TEST_READER_TOKEN"])
        self.addCleanup(reader.close)
        with self.assertRaises(dsec.PermissionDenied):
            reader.sandboxes.create(image=IMAGE, labels={"run": RUN})
        self.assertIsInstance(reader.sandboxes.list(), list)

    def test_token_admin_through_the_door(self) -> None:
        c = client()
        self.addCleanup(c.close)
        t = c.tokens.create(tenant="scratch", role="reader", ttl_s=600, description="py test")
        self.assertTrue(t.token and t.token.startswith("e2b_"))
        self.assertIn(t.id, [x.id for x in c.tokens.list()])
        self.assertEqual(c.tokens.revoke(t.id).state, "revoked")
        with dsec.Client(host=os.environ["DSEC_HOST"], ca=os.environ["DSEC_CA"], token=t.token) as revoked, self.assertRaises(dsec.Unauthenticated):
            revoked.version()


if __name__ == "__main__":
    unittest.main()
