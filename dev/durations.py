"""Per test file: how many tests and how long they took, from pytest's JUnit XML files.

    python dev/durations.py BEFORE.xml [AFTER.xml ...]     # a Markdown table (docs/TESTING.md)

Each XML is one run (several for one run are given joined by commas: quick.xml,rest.xml). A
file renamed between the runs is matched through RENAMED, so its row shows both runs.
"""

import collections
import sys
import xml.etree.ElementTree as ET

# old file name -> new: the test files named after the attack round that wrote them, renamed by
# feature or merged into the feature's file (issue 23)
RENAMED: dict[str, str] = {
    "tests/adversarial/test_redteam13b_encodings.py": "tests/adversarial/test_credential_bodies_encodings.py",
    "tests/adversarial/test_redteam13b_paths.py": "tests/adversarial/test_credential_paths.py",
    "tests/adversarial/test_redteam12_status.py": "tests/adversarial/test_exit_status_forgery.py",
    "tests/adversarial/test_redteam14_methods.py": "tests/adversarial/test_gate_method_override.py",
    "tests/adversarial/test_redteam12_gitview_time.py": "tests/adversarial/test_gitview_index_time.py",
    "tests/adversarial/test_redteam12_netadvice.py": "tests/adversarial/test_network_notice.py",
    "tests/adversarial/test_redteam16_org_loopback.py": "tests/adversarial/test_org_policy_loopback.py",
    "tests/adversarial/test_redteam16_org_mcp.py": "tests/adversarial/test_org_policy_mcp.py",
    "tests/adversarial/test_redteam16_bucket.py": "tests/adversarial/test_remote_bucket_tamper.py",
    "tests/adversarial/test_redteam16_flaky_s3.py": "tests/adversarial/test_remote_flaky_s3.py",
    "tests/adversarial/test_redteam16_reader_race.py": "tests/adversarial/test_remote_reader_race.py",
    "tests/adversarial/test_redteam16_faults.py": "tests/adversarial/test_remote_restore_full_disk.py",
    "tests/adversarial/test_redteam12_snapshot_dos.py": "tests/adversarial/test_snapshot_deep_wide_trees.py",
    "tests/adversarial/test_redteam15_vm_agent_port.py": "tests/adversarial/test_vm_agent_port.py",
    "tests/adversarial/test_redteam15_vm_sync.py": "tests/adversarial/test_vm_write_back.py",
    "tests/adversarial/test_redteam12_protected_symlink.py": "tests/adversarial/test_route_symlinks.py",
    "tests/adversarial/test_redteam13_echo.py": "tests/adversarial/test_credential_echo.py",
    "tests/adversarial/test_redteam13_elsewhere.py": "tests/adversarial/test_credential_routes.py",
    "tests/adversarial/test_redteam13_narrowing.py": "tests/adversarial/test_credential_methods.py",
    "tests/adversarial/test_redteam13_paths.py": "tests/adversarial/test_credential_paths.py",
    "tests/adversarial/test_redteam13_redirect.py": "tests/adversarial/test_credential_echo.py",
    "tests/adversarial/test_redteam13b_env.py": "tests/adversarial/test_env_pass_by_value.py",
    "tests/adversarial/test_redteam13b_methods.py": "tests/adversarial/test_credential_methods.py",
    "tests/adversarial/test_redteam13b_percent.py": "tests/adversarial/test_credential_echo.py",
    "tests/adversarial/test_redteam13b_source_file.py": "tests/adversarial/test_credential_leaks.py",
    "tests/adversarial/test_redteam13b_websocket.py": "tests/adversarial/test_credential_websocket.py",
    "tests/adversarial/test_redteam14_denied_rename.py": "tests/adversarial/test_denied_rename.py",
    "tests/adversarial/test_redteam14_export.py": "tests/adversarial/test_planted_names.py",
    "tests/adversarial/test_redteam14_grants.py": "tests/adversarial/test_grants_forgery.py",
    "tests/adversarial/test_redteam14_late_ask.py": "tests/adversarial/test_gate_approvals.py",
    "tests/adversarial/test_redteam14_ui_dos.py": "tests/adversarial/test_ui_page.py",
    "tests/adversarial/test_redteam14_ui_focus.py": "tests/adversarial/test_ui_page.py",
    "tests/adversarial/test_redteam15_vm_net.py": "tests/adversarial/test_vm_gate.py",
    "tests/adversarial/test_redteam16_org_credentials.py": "tests/adversarial/test_org_policy_gate.py",
}


def per_file(paths: str):
    n, secs = collections.Counter(), collections.Counter()
    for path in paths.split(","):
        for case in ET.parse(path).getroot().iter("testcase"):
            f = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
            f = RENAMED.get(f, f)
            n[f] += 1
            secs[f] += float(case.get("time") or 0)
    return n, secs


def main(runs):
    tables = [per_file(r) for r in runs]
    files = sorted(set().union(*(t[0] for t in tables)), key=lambda f: -tables[0][1].get(f, 0))
    head = "| file | " + " | ".join(f"run {i + 1}: tests | s" for i in range(len(runs))) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(runs)))
    for f in files:
        cells = []
        for n, secs in tables:
            cells += [str(n.get(f, "")), f"{secs[f]:.0f}" if f in n else ""]
        print(f"| {f} | " + " | ".join(cells) + " |")
    tot = []
    for n, secs in tables:
        tot += [str(sum(n.values())), f"{sum(secs.values()):.0f}"]
    print("| **total** | " + " | ".join(tot) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
