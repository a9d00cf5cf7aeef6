from herald.cli import main

raise SystemExit(main())
