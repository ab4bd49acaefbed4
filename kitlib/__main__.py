from kitlib.cli import main

raise SystemExit(main())
