"""Environment branches (issue 27): fork branches (a working tree of the project at a step,
its own `.envgit/`, the store shared by hard links) and rewound branches (the steps a rewind
stepped over, derived from the journal). Registry files: docs/FORMAT.md, "Branches"."""
