-- Turns documentation pages (Markdown) into man page text, for pandoc -t man.
-- The pages themselves stay written for the web; here:
--  * a link to another page keeps its words only (those pages are not
--    installed; the man pages name them in SEE ALSO), a web link its URL;
--  * a page's own title (a level-1 heading not in capitals) and its
--    introduction go (the man page's DESCRIPTION introduces it), and its
--    sections become man sections, in capitals;
--  * a table whose first column is "setting" becomes a list of tagged
--    paragraphs, "name (default: value)" then its meaning: a three-column
--    table of long prose wraps badly in a terminal.

local function is_page_title(b)
  if b.t ~= "Header" or b.level ~= 1 then
    return false
  end
  local text = pandoc.utils.stringify(b)
  return text ~= text:upper()
end

-- Runs first (pandoc applies a filter's Pandoc function after the
-- element functions, so this is a filter of its own below).
local function drop_page_intros(doc)
  local out, skipping = pandoc.List(), false
  for _, b in ipairs(doc.blocks) do
    if is_page_title(b) then
      skipping = true
    elseif b.t == "Header" then
      skipping = false
      out:insert(b)
    elseif not skipping then
      out:insert(b)
    end
  end
  doc.blocks = out
  return doc
end

function Header(h)
  return pandoc.Header(1, pandoc.text.upper(pandoc.utils.stringify(h)), h.attr)
end

function Link(l)
  if l.target:match("^%a[%w+.-]*://") then
    return nil
  end
  return l.content
end

local function inlines(cell)
  local out = pandoc.List()
  for _, b in ipairs(cell.contents) do
    if b.content then
      out:extend(b.content)
    end
  end
  return out
end

function Table(t)
  local head = t.head.rows[1]
  if not head or pandoc.utils.stringify(head.cells[1].contents) ~= "setting" then
    return nil
  end
  local items = pandoc.List()
  for _, body in ipairs(t.bodies) do
    for _, row in ipairs(body.body) do
      local term = inlines(row.cells[1])
      term:insert(pandoc.Str(" (default: "))
      term:extend(inlines(row.cells[2]))
      term:insert(pandoc.Str(")"))
      items:insert({term, {pandoc.Para(inlines(row.cells[3]))}})
    end
  end
  return pandoc.DefinitionList(items)
end

-- A long code word (a URL, a path) may break after / , ? & = ; : so that a
-- narrow terminal does not overflow (groff's "can't break line").
function Code(c)
  if #c.text <= 24 then
    return nil
  end
  local out = pandoc.List()
  for piece in c.text:gmatch("[^/,?&=;:]*[/,?&=;:]?") do
    if piece ~= "" then
      if #out > 0 then
        out:insert(pandoc.RawInline("man", "\\:"))
      end
      out:insert(pandoc.Code(piece, c.attr))
    end
  end
  return out
end

return {{Pandoc = drop_page_intros}, {Header = Header, Link = Link, Table = Table, Code = Code}}
