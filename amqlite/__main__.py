from amqlite.cli import main

raise SystemExit(main())
